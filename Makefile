# Tasks for developers; CI runs `bash .ci/run`, which does the same in a fresh venv.
.PHONY: help fast test lint types imports ci golden bench

help:  ## list the tasks
	@grep -E '^[a-z]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

fast:  ## the fast subset: the first case of every quick test (about 20 s on 2 idle cores)
	python -m pytest -q --fast

test:  ## every test, on one worker per core (the README's test command)
	python -m pytest

lint:  ## ruff lint and format check
	ruff check . && ruff format --check .

types:  ## mypy, strict, on the package and the tests
	mypy

imports:  ## the layer contract (import-linter)
	lint-imports

ci:  ## exactly what CI runs, in a fresh venv
	bash .ci/run

golden:  ## regenerate the golden files on purpose (review the diff)
	python tests/update_golden.py

bench:  ## start-up, compute, memory, rendering and loading, as ratios
	python benchmarks/bench.py
