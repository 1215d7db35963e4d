"""growlm: DeepSpeed GPT-2 pretraining that grows the model while it trains.

Install torch first (``pip install torch==2.13.0`` takes the CPU wheel on the project's machines), then
``pip install -e '.[mpi,dev]'``; ``make setup`` does both plus the system packages. The install is meant to be
editable: train.py finds ds_configs/ and the built-in corpus next to itself.
"""

from setuptools import find_packages, setup

setup(
    name="growlm",
    version="0.1.0",
    description="DeepSpeed GPT-2 pretraining with growth operators on the whole training state",
    python_requires=">=3.10",
    packages=find_packages(
        include=[
            "model",
            "model.*",
            "data",
            "growth",
            "growth.*",
            "eval",
            "eval.*",
            "runtime",
            "runtime.*",
            "trainer",
            "trainer.*",
        ]
    ),
    py_modules=["train"],
    package_data={"data": ["gpt2_bpe/*", "corpus/*.json", "corpus/*.md", "corpus/*/*.txt.xz"]},
    install_requires=[
        "torch>=2.5",  # torch.serialization.safe_globals (runtime.checkpoint.safe_load)
        "deepspeed>=0.19,<0.20",
        "transformers>=4.40",
        "datasets>=2.19",
        "tensorboard>=2.15",
        "tiktoken>=0.7",
        "tokenizers>=0.19",
        "safetensors>=0.4",
        "tqdm>=4.66",
        "numpy>=1.24",
        "pyyaml>=6",
        "matplotlib>=3.7",
    ],
    extras_require={
        "mpi": ["mpi4py>=3.1"],  # needs a system MPI (apt-get install libopenmpi-dev openmpi-bin)
        "dev": ["pytest>=8", "hypothesis>=6.100", "ruff>=0.6"],
    },
    entry_points={
        "console_scripts": [
            "growlm-train = train:main",
            "growlm-prepare = data.prepare:main",
            "growlm-build-corpus = data.build_corpus:main",
            "growlm-grow = growth.grow_checkpoint:main",
            "growlm-run = trainer.driver:main",
            "growlm-eval = eval.metrics.cli:main",
            "growlm-experiment = eval.experiments.staged:main",
            "growlm-bench = eval.bench.throughput:main",
        ]
    },
)
