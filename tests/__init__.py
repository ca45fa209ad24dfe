"""The course's tests.

graded/     the autograder: each test grades one exercise, through the `impl` fixture;
            its `_*.py` helpers are private to it
machinery/  tests of the course itself, one folder per kind (its __init__.py lists them)
peers/      tests that HF, vLLM and FlashInfer wrote for the same contracts, ported
support.py  the one public support module: helpers any of them share
conftest.py `--impl`, the `impl` fixture, exercise markers, the shared models, the mutants
"""
