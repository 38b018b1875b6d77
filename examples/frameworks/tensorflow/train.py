"""A plain TensorFlow script: `MultiWorkerMirroredStrategy` with a custom training loop, as TensorFlow's
multi-worker guide writes it.

Alone:        python train.py                (no TF_CONFIG: one worker)
Distributed:  trainmaster's `framework="tensorflow"` (see ../submit.py) runs it on every worker of
              Ray Train's TensorflowTrainer, which sets TF_CONFIG for the whole gang.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import tensorflow as tf

import trainmaster  # optional: per-epoch metrics; a no-op when run outside trainmaster

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", help="write what this worker saw here")
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG when it is set
world = strategy.num_replicas_in_sync
rank = strategy.cluster_resolver.task_id or 0


@tf.function
def all_reduce_rank() -> tf.Tensor:
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(float(rank + 1)))


total = float(strategy.experimental_local_results(strategy.run(all_reduce_rank))[0])

rng = np.random.default_rng(0)
inputs = rng.normal(size=(512, 8)).astype("float32")
labels = (inputs.sum(axis=1, keepdims=True) > 0).astype("float32")
global_batch = 64 * world
dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).repeat().batch(global_batch)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, "relu"), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.1)
batches = iter(strategy.experimental_distribute_dataset(dataset))


@tf.function
def train_step(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
    def replica_step(features: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = tf.keras.losses.binary_crossentropy(targets, model(features), from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))  # all-reduced across workers
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=batch), axis=None)


for step in range(args.steps):
    loss = float(train_step(next(batches)))
    trainmaster.log({"loss": loss}, step=step)
trainmaster.flush()
print(f"worker {rank}/{world}: all-reduce of rank+1 = {total}, loss {loss:.4f}", flush=True)
if args.out:
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"world_size": world, "rank": rank, "allreduce": total, "loss": loss}, f)
