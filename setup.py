"""growlm: DeepSpeed pretraining of GPT-2, Llama and Qwen 2 models that grows the model while it trains.

Install torch first (``pip install torch==2.13.0`` takes the CPU wheel on the project's machines; a GPU node keeps its
own CUDA torch), then ``pip install '.[mpi,dev]'`` (``-e`` for a clone you edit); ``make setup`` does both plus the
system packages. Everything installs under one import name, ``growlm``: the repository's top level is the package
(``package_dir={"growlm": "."}``), so ``model/`` is ``growlm.model`` and ``train.py`` is ``growlm.train``. The
DeepSpeed configs, the built-in corpus, the GPT-2 BPE files and the example plans are package data.
"""

from setuptools import setup

# the Python packages under the repository root, each installed as growlm.<name>; tests/ and results are not
SUBPACKAGES = [
    "model",
    "model.gpt2",
    "model.llama",
    "model.qwen2",
    "data",
    "runtime",
    "growth",
    "growth.ops",
    "growth.live",
    "growth.offline",
    "growth.stages",
    "trainer",
    "trainer.driver",
    "eval",
    "eval.metrics",
    "eval.bench",
    "eval.experiments",
]

setup(
    name="growlm",
    version="0.2.0",
    description="DeepSpeed pretraining of GPT-2, Llama and Qwen 2 that grows the model and its whole training state",
    python_requires=">=3.10",
    packages=["growlm", *(f"growlm.{p}" for p in SUBPACKAGES)],
    package_dir={"growlm": "."},
    package_data={
        "growlm": [
            "ds_configs/*.json",
            "ds_configs/gpu/*.json",
            "ds_configs/*.md",
            "data/gpt2_bpe/*",
            "data/corpus/*.json",
            "data/corpus/*.md",
            "data/corpus/*/*.txt.xz",
            "growth/plans/*.yaml",
        ]
    },
    install_requires=[
        "torch>=2.11",  # the oldest torch the unit tests ran on (2.11.0, as GPU images ship it; and 2.13.0)
        "deepspeed>=0.19,<0.20",
        "transformers>=4.45",  # the first whose Llama reads config.head_dim (earlier: hidden_size // n_head)
        "datasets>=2.19",
        "tensorboard>=2.15",
        "tiktoken>=0.7",
        "tokenizers>=0.19",
        "safetensors>=0.4",
        "tqdm>=4.66",
        "psutil>=5.9",
        "pydantic>=2.5",
        "scipy>=1.10",
        "numpy>=1.24",
        "pyyaml>=6",
        "matplotlib>=3.7",
    ],
    extras_require={
        "mpi": ["mpi4py>=3.1"],  # needs a system MPI (apt-get install libopenmpi-dev openmpi-bin)
        "dev": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "ruff>=0.6"],
    },
    entry_points={
        "console_scripts": [
            "growlm-train = growlm.train:main",
            "growlm-prepare = growlm.data.prepare:main",
            "growlm-build-corpus = growlm.data.build_corpus:main",
            "growlm-grow = growlm.growth.offline.cli:main",
            "growlm-run = growlm.trainer.driver:main",
            "growlm-eval = growlm.eval.metrics.cli:main",
            "growlm-experiment = growlm.eval.experiments.cli:main",
            "growlm-bench = growlm.eval.bench.throughput:main",
            "growlm-gpu-check = growlm.eval.bench.gpu_check:main",
        ]
    },
)
