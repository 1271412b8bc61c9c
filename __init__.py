"""ComfyUI entry of the Piecewise Sparse Attention pack (PISA / PWT for Wan2.1 and FLUX).

Importing this package never imports ComfyUI: the nodes (nodes/comfy_nodes.py, V3 schema) are loaded only
when ComfyUI calls `comfy_entrypoint()`, so the package and its `kernels` stay importable on their own.
"""
WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    from .nodes.comfy_nodes import comfy_entrypoint as entry

    return await entry()


__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
