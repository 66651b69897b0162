"""After-the-factory operations: re-verification, judge calibration, held-out evaluation."""
