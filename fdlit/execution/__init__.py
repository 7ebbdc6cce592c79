"""Execution back-ends: how clients are trained and queried (one client after another, all together
under vmap, or in Ray actors), and the automatic choice between them. The loop never trains a client
itself; methods' client parts run wherever the executor keeps the client."""

from fdlit.execution.executor import ClientExecutor, ClientStep, SequentialExecutor
from fdlit.execution.ray_executor import RayExecutor
from fdlit.execution.selection import select_executor
from fdlit.execution.vectorized import VectorizedExecutor

__all__ = ["ClientExecutor", "ClientStep", "RayExecutor", "SequentialExecutor", "VectorizedExecutor", "select_executor"]
