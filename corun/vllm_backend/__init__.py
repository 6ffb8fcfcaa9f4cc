"""CoRun's rules on vLLM engines (`--engine vllm`), for models only vLLM runs (MoE, MLA, quantized, tensor parallel).

Only vLLM's public extension points, pinned to the version in scripts/setup_vllm.sh:
- scheduler.FixedShapeVllmScheduler (`scheduler_cls`): the paper's Algorithms 1 and 2;
- sampling.RequestKeyedSampler (`logits_processors`): the project's request-keyed Gumbel-max sampling;
- worker.FixedDecodeShape (`worker_extension_cls`): every decode step at exactly N rows;
- runner.VllmModelRunner: a vLLM worker driven by the prefill and decode nodes' own schedules.
engine_args.vllm_engine_kwargs is where all the settings are made (CPU and CUDA).
"""
