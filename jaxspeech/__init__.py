"""jaxspeech: speech recognition and synthesis in JAX.

Importing the package, before anything else of it, makes numba's on-disk cache (librosa's
compiled functions) safe for processes that compile side by side (`audio.numba_cache`),
and, in a process started as one of the commands, turns a Ctrl-C while it still imports
its libraries into one line (`runs.crash.one_line_interrupts`). Both use only the standard
library.
"""

from jaxspeech.audio import numba_cache as _numba_cache
from jaxspeech.runs import crash as _crash

_numba_cache.install()
_crash.one_line_interrupts()
