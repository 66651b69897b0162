"""One module per factory stage: generate, validate, isolate, score, assemble, audit, curriculum, land."""
