"""tidelog's compiled code: the one C extension module, ``tidelog._crc32c``.

Everything else about the package (its metadata, dependencies, packages) is in pyproject.toml;
this file only declares the extension, because setuptools still calls the pyproject.toml form
(``[tool.setuptools] ext-modules``) experimental and warns on every build. ``make install``
(``pip install -e``) builds it; in a work tree, ``python setup.py build_ext --inplace`` puts the
module beside the sources (docs/architecture.md, "Native code").
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tidelog._crc32c",
            sources=["src/tidelog/native/crc32c.c"],
            extra_compile_args=["-Wall", "-Wextra"],
        )
    ]
)
