# Two entry points: `make run` (the main job) and `make test`. Both create .venv when missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DATA ?= $(HOME)/.cache/shiftlab/data
RUN_DIR ?= runs/imagenet-r-rn50
METHODS ?= all
ARGS ?=
# the requests MLflow's client needs (see the install below)
MLFLOW_REQUESTS := 2.34.2

.PHONY: run test demo bench clean-venv

# The exact tested versions (constraints.txt) of the library, plotting and test dependencies.
# --no-compile: pip would byte-compile all 16,750 modules it installs (~45 s of CPU, torch's and CUDA's wheels
# mostly); Python compiles the ~5,500 that shiftlab and its tests import when first imported (~14 s, once).
$(BIN)/shiftlab: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e '.[report,test]'
	# MLflow's client (tests/test_trackers.py reads its file store back) needs requests >= 2.28.1, which
	# torchattacks 3.5.1 (PGD's reference in the tests) declares it cannot take (requests ~= 2.25.1) though it
	# runs with it: installed second, with that one pin raised; pip then warns about torchattacks' declaration.
	# `shiftlab[mlflow]`, not `-e .[mlflow]`: the extra read from the editable install just made, not built again.
	sed 's/^requests==.*/requests==$(MLFLOW_REQUESTS)/' constraints.txt > $(VENV)/constraints-mlflow.txt
	$(BIN)/python -m pip install -q --no-compile -c $(VENV)/constraints-mlflow.txt 'shiftlab[mlflow]' requests==$(MLFLOW_REQUESTS)
	touch $(BIN)/shiftlab

# Downloads ImageNet-R and the OpenAI RN50 weights on first use (needs internet),
# then evaluates every registered method with the default protocol.
run: $(BIN)/shiftlab
	$(BIN)/shiftlab run --dataset imagenet-r --data $(DATA) --download \
	    --model RN50 --pretrained openai --methods $(METHODS) --out $(RUN_DIR) --resume $(ARGS)

# pytest-xdist: one worker per CPU core (TEST_WORKERS=0: one process); --dist loadfile keeps a file's tests on
# one worker, so its module-scoped runs are made once. PYTHONDONTWRITEBYTECODE is unset for the tests: with it,
# every CLI subprocess compiles shiftlab again and pytest rewrites every test module's asserts on every run.
# With workers, each (and every run it starts) computes on one thread: N workers x N threads oversubscribe the cores
TEST_WORKERS ?= auto
TEST_THREADS = $(if $(filter 0,$(TEST_WORKERS)),,OMP_NUM_THREADS=1)
test: $(BIN)/shiftlab
	$(BIN)/ruff check src tests
	env -u PYTHONDONTWRITEBYTECODE $(TEST_THREADS) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

demo: $(BIN)/shiftlab
	$(BIN)/shiftlab demo

bench: $(BIN)/shiftlab
	$(BIN)/shiftlab bench $(ARGS)

clean-venv:
	rm -rf $(VENV)
