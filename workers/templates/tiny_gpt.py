"""builtin:tiny-gpt — a small character-level transformer on text shipped in the package.

Config: steps (200), context (64), layers (2), heads (4), width (64), batch_size (32), lr (3e-3),
eval_every (50), seed (0), ledger_path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import trainmaster
from workers.templates.common import append_ledger, report, resume

TEXT = Path(__file__).with_name("data") / "tiny.txt"


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int, heads: int, width: int):
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = torch.triu(torch.full((length, length), float("-inf"), device=tokens.device), diagonal=1)
        x = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        return self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def batches(data: torch.Tensor, context: int, batch_size: int, generator: torch.Generator):
    while True:
        starts = torch.randint(0, len(data) - context - 1, (batch_size,), generator=generator)
        inputs = torch.stack([data[s : s + context] for s in starts])
        targets = torch.stack([data[s + 1 : s + context + 1] for s in starts])
        yield inputs, targets


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch

    text = TEXT.read_text()
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    context = int(config.get("context", 64))
    steps, eval_every = int(config.get("steps", 200)), int(config.get("eval_every", 50))
    rank = ray.train.get_context().get_world_rank()
    generator = torch.Generator().manual_seed(int(config.get("seed", 0)) + rank)
    torch.manual_seed(int(config.get("seed", 0)))

    model: nn.Module = TinyGPT(
        len(vocab), context, int(config.get("layers", 2)), int(config.get("heads", 4)), int(config.get("width", 64))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(config.get("lr", 3e-3)))
    start = 0
    state = resume(model, optimizer)
    if state is not None:
        start = int(state["step"])
    model = ray.train.torch.prepare_model(model)
    device = ray.train.torch.get_device()
    if rank == 0:
        append_ledger(config.get("ledger_path"), start_step=start)

    stream = batches(data, context, int(config.get("batch_size", 32)), generator)
    running = math.log(len(vocab))
    for step in range(start + 1, steps + 1):
        inputs, targets = next(stream)
        logits = model(inputs.to(device))
        loss = F.cross_entropy(logits.reshape(-1, len(vocab)), targets.to(device).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        running = 0.9 * running + 0.1 * loss_value
        trainmaster.log({"loss": loss_value, "loss_smooth": running}, step=step)
        if step % eval_every == 0 or step == steps:
            inner: nn.Module = getattr(model, "module", model)
            report(
                {"step": step, "loss": running},
                {"step": step, "model": inner.state_dict(), "optimizer": optimizer.state_dict()},
            )
            if rank == 0:
                print(f"step {step}: loss {running:.3f}", flush=True)
