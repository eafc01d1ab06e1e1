"""The persistent compilation cache's entries are compressed with zstd: dew depends on
``zstandard`` (pyproject.toml), which JAX uses where it is installed and zlib otherwise (for a
257 MB CPU executable zlib took 5.4 s to write it and 0.74 s to read it, zstd 0.65 s and 0.30 s;
benchmarks/RESULTS.md)."""

from __future__ import annotations

from jax._src import compilation_cache  # jax's module that picks the cache's codec

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # the first bytes of every zstd frame (RFC 8878)


def test_jax_compresses_the_cache_with_zstd():
    data = bytes(range(256)) * 4096
    packed = compilation_cache.compress_executable(data)
    assert packed[:4] == ZSTD_MAGIC, f"not zstd: {packed[:4]!r} (zlib's start with 0x78)"
    assert compilation_cache.decompress_executable(packed) == data
