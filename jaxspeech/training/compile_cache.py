"""JAX's persistent compilation cache for training (train.compile_cache_dir).

Its entries are native code that JAX loads and runs without checking (JAX's docs: a cache
is to be trusted like the code itself), so the default is the user's own private cache,
`{cache}/jit` (`storage.cache_root()`), never a directory that came with a run from
elsewhere. Entries are keyed by a hash of the program (with the jax version, the backend
and the compile options), so every run of the user shares them. Several trainers may
write at once: JAX's cache takes its file lock only under a size bound (without one, a
reader can load an entry another process is still writing), so `use` sets one unless
the user did.
"""

from __future__ import annotations

import os

import jax

from jaxspeech.common import storage

MAX_BYTES = 16 * 2**30  # the bound set when the user set none (least recently used go)


def path(setting: str, workdir: str) -> str:
    """train.compile_cache_dir `setting` with {cache} = `storage.cache_root()` and
    {workdir} = the run directory `workdir`."""
    return setting.format(workdir=os.path.abspath(workdir), cache=storage.cache_root())


def use(setting: str, workdir: str) -> str:
    """Points JAX's persistent compilation cache at `path(setting, workdir)` (a local one
    created private to the user) and bounds it (`MAX_BYTES`, unless set); returns it."""
    where = path(setting, workdir)
    if not storage.is_remote(where):
        os.makedirs(where, mode=0o700, exist_ok=True)
    if jax.config.jax_compilation_cache_max_size == -1:
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    jax.config.update("jax_compilation_cache_dir", where)
    return where
