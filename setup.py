from setuptools import find_packages, setup

setup(
    name="ms_dynvm",
    version="0.1.0",
    description="A just-in-time compiler and runtime for MindSpore's eager (PyNative) mode",
    packages=find_packages(include=["ms_dynvm", "ms_dynvm.*"]),
    package_data={"": ["../cuda_templates/*"], "ms_dynvm.frontend": ["_crecord.c"]},
    python_requires=">=3.11",
    install_requires=["mindspore==2.10.0", "numpy>=1.26,<2"],
    extras_require={
        "gpu": ["pycuda", "cuda-python"],
        "test": ["pytest", "hypothesis"],
    },
    entry_points={"console_scripts": []},
)
