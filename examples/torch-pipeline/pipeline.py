#!/usr/bin/env python3
"""A pipeline-parallel forward of a small GPT-2-like model with torch.distributed (gloo, CPU), written as for
torchrun: it reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT through init_method="env://" and nothing of
pp-launch's. Run it as a chain with `pp-launch chain --rendezvous torch` (docs/torch-pipeline.md).

  pipeline.py write-weights DIR STAGES   each stage's shard of the model (from its seed) to DIR/stage-K/shard.pt
  pipeline.py [--weights DIR]            one rank: its shard from DIR (/weights), activations to the next rank,
                                         the logits back to rank 0, which checks them against a single process

Rank 0 prints `PP_TORCH_RESULT max_abs_diff=D match=true|false` and how long the pipeline step took.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

SEED, LAYERS, WIDTH, HEADS, VOCAB, SEQ = 1234, 8, 256, 4, 1024, 32


def model() -> torch.nn.ModuleDict:
    """The whole model, from its seed: embeddings, LAYERS pre-norm transformer blocks, the head."""
    torch.manual_seed(SEED)
    return torch.nn.ModuleDict(
        {
            "tok": torch.nn.Embedding(VOCAB, WIDTH),
            "pos": torch.nn.Embedding(SEQ, WIDTH),
            "blocks": torch.nn.ModuleList(block() for _ in range(LAYERS)),
            "head": torch.nn.Linear(WIDTH, VOCAB),
        }
    ).eval()


def block() -> torch.nn.Module:
    return torch.nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True)


def layers_of(rank: int, world: int) -> range:
    per, extra = divmod(LAYERS, world)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (1 if rank < extra else 0))


MASK = torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1)  # causal, as GPT-2's


def embed(m: torch.nn.ModuleDict, tokens: torch.Tensor) -> torch.Tensor:
    return m["tok"](tokens) + m["pos"](torch.arange(SEQ).unsqueeze(0))


def blocks(m: torch.nn.ModuleDict, ids: range, x: torch.Tensor) -> torch.Tensor:
    for i in ids:
        x = m["blocks"][i](x, src_mask=MASK)
    return x


def tokens() -> torch.Tensor:
    torch.manual_seed(SEED + 1)
    return torch.randint(0, VOCAB, (1, SEQ))


def write_weights(folder: str, stages: int) -> int:
    whole = model().state_dict()
    for k in range(stages):
        keep = [f"blocks.{i}." for i in layers_of(k, stages)]
        keep += ["tok.", "pos."] if k == 0 else []
        keep += ["head."] if k == stages - 1 else []
        shard = {name: t for name, t in whole.items() if name.startswith(tuple(keep))}
        os.makedirs(os.path.join(folder, f"stage-{k}"), exist_ok=True)
        torch.save(shard, os.path.join(folder, f"stage-{k}", "shard.pt"))
    print(f"wrote {stages} shards of {LAYERS} layers to {folder}", flush=True)
    return 0


def run(weights: str) -> int:
    torch.set_num_threads(1)  # the same kernels, in the same order, as the single process that checks the result
    if os.environ.get("PIPELINE_HANG_RANK") == os.environ.get("RANK"):  # for tests: a rank that never joins
        time.sleep(3600)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    m = model()  # the structure; this rank's weights are its shard's, read from the mount
    loaded = m.load_state_dict(torch.load(os.path.join(weights, "shard.pt")), strict=False)
    if loaded.unexpected_keys:
        raise SystemExit(f"{weights}/shard.pt is not a shard of this model: {loaded.unexpected_keys[:3]}")
    with torch.no_grad():
        started = time.monotonic()
        if rank == 0:
            x = blocks(m, layers_of(0, world), embed(m, tokens()))
        else:
            x = torch.empty(1, SEQ, WIDTH)
            dist.recv(x, src=rank - 1)
            x = blocks(m, layers_of(rank, world), x)
        if rank == world - 1:
            logits = m["head"](x)
            if world > 1:
                dist.send(logits, dst=0)
        elif rank < world - 1:
            dist.send(x, dst=rank + 1)
        if rank == 0:
            if world > 1:
                logits = torch.empty(1, SEQ, VOCAB)
                dist.recv(logits, src=world - 1)
            step = time.monotonic() - started
            whole = model()
            reference = whole["head"](blocks(whole, range(LAYERS), embed(whole, tokens())))
            diff = float((logits - reference).abs().max())
            print(f"PP_TORCH_RESULT max_abs_diff={diff} match={'true' if diff == 0.0 else 'false'} step_s={step:.3f}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["write-weights"]:
        return write_weights(argv[1], int(argv[2]))
    weights = argv[argv.index("--weights") + 1] if "--weights" in argv else "/weights"
    return run(weights)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
