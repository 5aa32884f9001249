"""Property-based fuzzing of every parser that reads hostile input (issue 6, item 4).

One module per target family. A default run is quick (CI); ``NRI_GPU_FUZZ_LONG=1``
runs at least 100,000 cases per test. See ``support.py`` for the profiles, the seed
and the hang guard.
"""
