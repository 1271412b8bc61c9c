"""Small media files the ComfyUI tests put into a server's input folder (written with PyAV, a ComfyUI
requirement): the shipped training workflow loads a clip, and the frontend previews it."""
from __future__ import annotations

from pathlib import Path

TRAIN_CLIP = "psa_train_clip.mp4"  # the clip named in workflows/*train_lora*.json


def write_tiny_clip(path: Path, frames: int = 5, size: int = 64) -> Path:
    """A valid `frames`-frame mp4 (MPEG-4 part 2, ffmpeg's built-in encoder) of a moving gradient."""
    import av
    import numpy as np

    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("mpeg4", rate=16)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        y, x = np.mgrid[0:size, 0:size]
        for i in range(frames):
            img = np.stack([(x * 4 + i * 20) % 256, (y * 4) % 256, np.full_like(x, 128)], -1).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path
