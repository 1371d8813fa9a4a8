"""Other libraries' words for failures, matched where they are said: the errors that only their
text tells apart (no exception type or status code of their own), all here, so that a library
that rewords one is met in one place; each is provoked from the pinned versions
(tests/test_library_errors.py). Of the project it imports nothing: every layer matches them."""

import re

# Tensorstore's (through orbax): the OS's reason in its error text, and its status for ENOSPC and
# EDQUOT.
TENSORSTORE_OS_REASON = re.compile(r':\s*([^:\[\]]+?)\s*\[os_error_code')
TENSORSTORE_SPACE_STATUS = 'RESOURCE_EXHAUSTED'
TENSORSTORE_DENIED_STATUS = 'PERMISSION_DENIED'  # A file this user may not read.
# Tensorstore's statuses for bytes that are missing, cut short or wrong, in plain ValueErrors that
# orbax passes on or quotes: 'NOT_FOUND: Error reading ...', 'Truncated Zstd-compressed stream', and
# a chunk that no longer decodes: 'FAILED_PRECONDITION: ... ZSTD_decompressStream() failed: Data
# corruption detected' (or 'Unknown frame descriptor').
TENSORSTORE_DAMAGE_STATUS = re.compile(
    r'^(NOT_FOUND|DATA_LOSS|OUT_OF_RANGE):|Truncated \S+ stream|ZSTD_decompressStream\(\) failed',
    re.M)
# Orbax's ValueErrors for a saved tree that differs from the one asked for: 'User-provided restore
# item and on-disk value metadata tree structures do not match', 'Requested shape: (256,) is not
# compatible with the stored shape: (512,)', and jax's 'pytree structure error: ...' under orbax.
ORBAX_TREE_MISMATCH = re.compile(
    r'tree structures do not match|pytree structure|not compatible with the stored shape')
# Orbax's warning of a step folder without _CHECKPOINT_METADATA: a checkpoint not written whole.
ORBAX_NO_STEP_METADATA = 'Metadata file does not exist'
# Orbax's warning when a checkpoint it is to delete is already gone (removed by hand): the folder.
ORBAX_STEP_GONE = re.compile(r'^Unable to find the step \d+ for deletion.* under (.+)\.$', re.S)
# XLA's words when a device (on the CPU, the machine) cannot allocate a buffer: 'RESOURCE_EXHAUSTED:
# Out of memory while trying to allocate N bytes' or '... Failed to allocate request for ...' on a
# GPU, 'Out of memory allocating N bytes' on the CPU (after 'INTERNAL: ...' from a running program).
DEVICE_OUT_OF_MEMORY = re.compile(r'RESOURCE_EXHAUSTED|Out of memory')
# The allocation that failed, in those words. A GPU's compiler out of memory while it tries kernels
# (autotuning) heads its text 'RESOURCE_EXHAUSTED: Failed to get configs for: 17 out of 81
# instructions. See logs for all failures. Example failure:' and names it further on (seen on an
# NVIDIA H200 with jax 0.11.2: '... Out of memory while trying to allocate 19.09GiB with ...').
DEVICE_ALLOCATION = re.compile(
    r'Out of memory (?:while trying to allocate|allocating) [\d.]+ ?(?:[KMGTP]i?B|bytes)')
# Python's RuntimeError when the OS will not start another thread (memory, or a limit of processes).
THREAD_REFUSED = "can't start new thread"
# The system's words (glibc's dlerror) when a compiled library cannot be mapped into the process:
# its filesystem is mounted noexec, or the process's memory limit or the machine's memory is spent.
LIBRARY_UNMAPPED = re.compile(r'^(.+?): failed to map segment from shared object')
# Asyncio's RuntimeError when a thread finishes work for an event loop that was closed.
ASYNCIO_LOOP_CLOSED = 'Event loop is closed'
# JAX's warning when its persistent compilation cache cannot be read or written.
JAX_CACHE_TROUBLE = re.compile(r'Error (reading|writing) persistent compilation cache')
# What a collective (gloo), or a barrier of JAX's coordination service, fails with once a peer is
# gone; and the first line of JAX's abort when that service reports a lost process.
PEER_LOST = re.compile(r'Gloo|[Cc]onnection (reset|closed|refused)|Socket closed|UNAVAILABLE|'
                       r'heartbeat|[Bb]arrier')
JAX_ABORT = b'Terminating process because the JAX distributed service detected fatal errors'
# JAX's words for a backend that JAX_PLATFORMS names and that cannot start: "Unable to initialize
# backend 'tpu': ABORTED: The TPU is already in use by process with pid 2718. ... (set
# JAX_PLATFORMS='' to automatically choose an available backend)"; where it is unset, "(you may need
# to uninstall the failing plugin package, or set JAX_PLATFORMS=cpu to skip this backend.)".
BACKEND_CANNOT_START = re.compile(
    r"Unable to initialize backend '([^']+)': (.*?)"
    r"(?: \((?:set JAX_PLATFORMS=|you may need to uninstall the failing plugin).*)?$", re.S)
# Its words when the TPU failed where JAX_PLATFORMS is unset (JAX then runs on the CPU, saying so
# in a warning only) and `jax.devices('tpu')` asks for it: "Backend 'tpu' failed to initialize:
# ABORTED: The TPU is already in use by process with pid 2718. Not attempting to load libtpu.so in
# this process.. Available backends are ['cpu']".
TPU_FAILED_QUIETLY = re.compile(
    r"Backend 'tpu' failed to initialize: (.*?)\.*\s*Available backends")
# And for a backend it has no plugin for: "Backend 'rocm' is not in the list of known backends:
# ['cpu', 'tpu']."
BACKEND_UNKNOWN = re.compile(r"not in the list of known backends: \[([^\]]*)\]")
# The reasons among them that say another process holds the device, and that libtpu is missing.
BACKEND_HELD, TPU_HELD, BACKEND_LIBTPU = 'in use', 'already in use', 'libtpu'
