"""The Triton backend of global-local attention (backend="triton", the CUDA default).

`attention` is the backend the registry loads (plan and run, the autograd function); the kernels
are `forward`, `dq` and `dkdv` on the shared device helpers of `tiles`, launched from `launches`;
`labels` derives labels and masks in registers, `blocks` the tables that let programs skip
empty tiles, `config` the tiles per GPU architecture and what is refused before launch; `aot`
compiles the kernels for a GPU you do not have (`python -m graphattn.kernels.triton.aot`).
Nothing here is imported by `graphattn.kernels` until the backend is asked for.
"""
