"""Benchmark and quality harness: SPRINTER against AR, SD, the draft and llama.cpp.

Modules, one job each: `prompts` (what is generated), `runner` (methods interleaved
prompt by prompt), `quality` (HumanEval, ROUGE-L, exact match, target log-prob, eta_FP),
`costmodel` (this machine's decode costs and predicted tokens/s), `peers` (llama-cpp-python
as a user runs it), `plot` and `report` (PNG, JSON, Markdown).
"""
