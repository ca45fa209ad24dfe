"""The course's benchmarks: one module per measurement, each run as a script
(`python benchmarks/serving.py`, or `python -m benchmarks.serving`) that prints one JSON object
and, with `--record PATH`, writes it as a record (utils/records.py, the one writer of
`benchmarks/results/*.json`). A package so that its modules import each other and the tests
import them, by name."""
