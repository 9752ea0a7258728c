"""`make gpu-check`: one command that checks what only a GPU host can, and one summary.

    python -m dpstudy.gpucheck [--out results/gpu-check]
        [--only tests,study,loader,resnet,lm,grayscale,comm,forecast,scaling,trace,zero]

The eleven items (registry.ITEMS, in order): the gpu-marked tests; the default study on CUDA to
the HTML report; the device loader against source 002's DataLoader; ResNet-18 training
throughput and MFU; GPT-2 small's tokens/s and MFU, compiled, and the memory plan against the
allocator with and without activation checkpointing; the CUDA rgb_to_grayscale's bandwidth
against the device's peak; NCCL and
Gloo all-reduce on CUDA tensors; forecasts of throughput and memory checked against cells; on 3+
GPUs, forecasts beyond two GPUs checked against cells (not applicable on fewer); a trace of a
two-rank Gloo DDP cell on one GPU, reduced from its CUDA kernels; DeepSpeed's ZeRO-2 and ZeRO-3
beside FSDP full on GPT-2 small, tokens/s, MFU and the memory plan against the allocator.
Each writes <out>/raw/<item>.json (and its tables); summary.md
is rewritten from all raw files present after every run (summary.render). Without a GPU: one
line, exit status 77 (runner.NO_GPU), nothing written.

Modules: registry (items, figures, targets), runner (the command), worker (one item in a child
process), gputests, study, measurements, lm (with lm_figures), forecast, scaling, trace and zero
(with zero_figures) (what items 1, 2, 3-4 and 6-7, 5, 8, 9, 10 and 11 do), figures (how figures
read and are judged), summary (summary.md from the raw files).
Nothing heavy is imported here: the runner decides about the GPU before anything else runs.
"""
