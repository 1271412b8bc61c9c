"""ComfyUI glue: `policy` decides when to sparsify (pure Python), `patch` installs the attention override
(torch, no ComfyUI import at import time), `comfy_nodes` holds the V3 nodes (imports comfy_api),
`probe_report` renders the probe's heat map."""
