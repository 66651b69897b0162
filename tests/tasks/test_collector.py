"""tasks.rollout.collector.frozen_before: what exists before a batch is out of the garbage collector's sight
during it and back after it; cycles the batch makes are still collected during it; nested and
concurrent batches share one freeze; a process's own freeze is left alone; the stages use it."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from gymfoundry.tasks.rollout import collector
from gymfoundry.tasks.rollout.collector import frozen_before


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture(autouse=True)
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()
    assert collector._batches == 0


def test_what_existed_is_frozen_during_the_batch_and_back_after():
    before = Node()
    with frozen_before():
        assert gc.get_freeze_count() > 0
        assert gc.is_tracked(before)
    assert gc.get_freeze_count() == 0


def test_a_cycle_the_batch_makes_is_collected_during_the_batch():
    with frozen_before():
        gone = weakref.ref(Node())
        assert gone() is not None
        gc.collect()
        assert gone() is None


def test_a_cycle_that_became_garbage_during_the_batch_is_collected_after_it():
    node = Node()
    gone = weakref.ref(node)
    with frozen_before():
        del node
        gc.collect()
        assert gone() is not None  # frozen: out of sight
    gc.collect()
    assert gone() is None


def test_nested_batches_share_one_freeze_and_an_error_lifts_it():
    with frozen_before():
        with frozen_before():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0  # the inner end does not lift it
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with frozen_before():
            raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0 and collector._batches == 0


def test_batches_side_by_side_in_threads_share_one_freeze():
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with frozen_before():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with frozen_before():
            second_in.set()
            first_out.wait(5)
            seen["after the first ended"] = gc.get_freeze_count()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["after the first ended"] > 0 and gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_its_freeze_as_it_was():
    Node()
    gc.freeze()
    theirs = gc.get_freeze_count()
    made = [Node() for _ in range(1000)]
    with frozen_before():
        # nothing frozen from here (the made nodes would be; other threads may free frozen objects)
        assert gc.get_freeze_count() <= theirs
    assert 0 < gc.get_freeze_count() <= theirs and made


def test_the_scoring_stage_runs_in_a_batch(monkeypatch):
    from gymfoundry.tasks.stages import score

    inside = []
    monkeypatch.setattr(score, "score_rules", lambda *a: inside.append(gc.get_freeze_count()) or [])
    assert score.score_steps([], []).scores == []
    assert inside and inside[0] > 0 and gc.get_freeze_count() == 0


def test_a_child_forked_during_a_batch_starts_with_no_batch_and_no_freeze():
    import os

    with frozen_before():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave at once
            try:
                os.write(write, f"{collector._batches} {gc.get_freeze_count()}".encode())
            finally:
                os._exit(0)
        os.close(write)
        report = os.read(read, 100).decode()
        os.close(read)
        os.waitpid(pid, 0)
        assert gc.get_freeze_count() > 0  # the parent's batch goes on frozen
    assert report == "0 0"
