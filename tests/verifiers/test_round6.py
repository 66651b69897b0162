"""`gymfoundry.verifiers.rules.round6` returns a float with an integral value as it is instead of calling
`round(value, 6)`: it must be `round(value, 6)` exactly, bit for bit (the sign of zero included),
for every value a score row can hold, and raise what round raises."""

from __future__ import annotations

import math
import random
import struct

import pytest

from gymfoundry.verifiers.rules import round6

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 1e-7, -1e-7, 5e-7, 4.9999995e-7, 0.1 + 0.2, 1 / 3, -2 / 3,
           0.2 * 3 - 0.7 * 0.5, 2.0 ** 52, 2.0 ** 52 + 1, 2.0 ** 53, 2.0 ** 53 + 2, 2.0 ** 60, 1e15 + 0.5, 1e16, 1e22,
           1e300, -1e300, 1.7976931348623157e308, 5e-324, -5e-324, 2.2250738585072014e-308, 123456.0000005,
           math.inf, -math.inf, 0.9999995, -0.9999995, 0.12345650000000001]


def bits(value):
    return struct.pack("<d", value) if type(value) is float else (type(value), value)


def same(a, b):
    if type(a) is float and math.isnan(a):
        return type(b) is float and math.isnan(b)
    return type(a) is type(b) and bits(a) == bits(b)


def test_round6_is_round_bit_for_bit_on_special_and_random_floats():
    rng = random.Random(5)
    values = SPECIAL + [math.nan]
    values += [rng.uniform(-1, 1) for _ in range(20000)]
    values += [round(rng.uniform(-1, 1), rng.randint(0, 8)) for _ in range(20000)]
    values += [float(rng.randint(-10 ** 6, 10 ** 6)) for _ in range(5000)]
    values += [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(20000)]
    values += [-v for v in values]
    for value in values:
        assert same(round6(value), round(value, 6)), value


@pytest.mark.parametrize("value", [0, -1, 7, True, False, 2 ** 70])
def test_round6_of_other_numbers_is_round(value):
    assert same(round6(value), round(value, 6))


@pytest.mark.parametrize("value", [None, "0.5", [1.0]])
def test_round6_raises_what_round_raises(value):
    with pytest.raises(TypeError) as ours:
        round6(value)
    with pytest.raises(TypeError) as theirs:
        round(value, 6)
    assert str(ours.value) == str(theirs.value)
