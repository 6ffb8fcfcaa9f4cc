#!/usr/bin/env bash
# vLLM's own serving benchmark at its defaults (1000 prompts sent at once) against `corun serve` on this host.
#   bash benchmarks/vllm_bench_burst.sh MODEL_DIR PORT OUT_LOG [corun serve flags...]
# e.g. bash benchmarks/vllm_bench_burst.sh models/tiny 8313 results.log --max-pending-requests 256
# Needs .venv-vllm (scripts/setup.sh). Prints the benchmark's summary; OUT_LOG keeps it.
set -u
# VLLM_BENCH_ARGS: more of vllm bench serve's own flags, e.g. "--backend openai-chat --endpoint /v1/chat/completions"
read -r -a BENCH_ARGS <<< "${VLLM_BENCH_ARGS:-}"
model=$1; port=$2; out=$3; shift 3
cd "$(dirname "$0")/.."
serve_log=$(mktemp)
.venv/bin/corun serve --model "$model" --prefill 1 --decode 1 --port "$port" "$@" > "$serve_log" 2>&1 &
serve_pid=$!
trap 'kill -INT $serve_pid 2>/dev/null; wait $serve_pid; rm -f "$serve_log"' EXIT
for _ in $(seq 180); do grep -q "cluster ready" "$serve_log" && break; sleep 1; done
timeout 600 .venv-vllm/bin/python benchmarks/vllm_bench_serve.py --backend openai --base-url "http://127.0.0.1:$port" \
  --model "$model" --dataset-name random --random-input-len 64 --random-output-len 32 --num-prompts 1000 \
  --ignore-eos "${BENCH_ARGS[@]}" 2>&1 | sed -n '/Serving Benchmark Result/,/^=*$/p' | tee "$out"
