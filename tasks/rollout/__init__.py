"""The episode machinery: episodes (`episodes`: one, or a batch), the scheduler that plays episodes under
the step time limit (`scheduler`), the concurrent engine, retries, classification, the
collector guard and progress reporting."""
