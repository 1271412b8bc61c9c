"""Piecewise sparse attention (PISA / PWT): the operator, importable without ComfyUI."""
from .api import piecewise_sparse_attention
from .config import SparseConfig
from .dispatch import backend_status, select_backend
from .reorder import inverse_order, morton_order

__all__ = ["piecewise_sparse_attention", "SparseConfig", "backend_status", "select_backend",
           "morton_order", "inverse_order"]
__version__ = "0.1.0"
