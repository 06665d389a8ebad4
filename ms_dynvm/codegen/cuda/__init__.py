"""CUDA backend: kernel specs -> CUDA C (render) -> NVRTC (nvrtc) -> pycuda launches (kernel)."""
