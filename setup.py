"""Build and install mmlinattn with its compiled ops, ``mmlinattn._ext``.

The C++ (CPU) sources under ``ops/csrc`` are always compiled; the CUDA sources (``*.cu``) are added
when ``torch.cuda.is_available()`` or ``FORCE_CUDA=1`` (``TORCH_CUDA_ARCH_LIST`` is honoured).
Both are compiled as C++20, which the torch 2.14 headers require. ``MMLINATTN_SKIP_EXT=1`` installs
the Python package only (the set-up script uses it after restoring a cached build of the extension).
"""
import os
from glob import glob

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join('ops', 'csrc')


def read_version():
    namespace = {}
    with open(os.path.join(ROOT, 'mmlinattn', 'version.py')) as f:
        exec(f.read(), namespace)
    return namespace['__version__']


def extension_modules():
    if os.getenv('MMLINATTN_SKIP_EXT', '0') == '1':
        return [], {}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    cpp_sources = sorted(glob(os.path.join(CSRC, '**', '*.cpp'), recursive=True))
    cuda_sources = sorted(glob(os.path.join(CSRC, '**', '*.cu'), recursive=True))
    with_cuda = torch.cuda.is_available() or os.getenv('FORCE_CUDA', '0') == '1'
    cxx_flags = ['-std=c++20', '-O3', '-fopenmp']
    define_macros = []
    if with_cuda:
        define_macros.append(('MMLINATTN_WITH_CUDA', None))
        ext = CUDAExtension(
            'mmlinattn._ext',
            sources=cpp_sources + cuda_sources,
            include_dirs=[os.path.join(ROOT, CSRC)],
            define_macros=define_macros,
            extra_compile_args={
                'cxx': cxx_flags,
                'nvcc': ['-std=c++20', '-O3', '--use_fast_math', '--expt-relaxed-constexpr'],
            },
            extra_link_args=['-fopenmp'])
    else:
        ext = CppExtension(
            'mmlinattn._ext',
            sources=cpp_sources,
            include_dirs=[os.path.join(ROOT, CSRC)],
            define_macros=define_macros,
            extra_compile_args={'cxx': cxx_flags},
            extra_link_args=['-fopenmp'])
    return [ext], {'build_ext': BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = extension_modules()

setup(
    name='mmlinattn',
    version=read_version(),
    description='LaplacianFormer and PolaFormer linear-attention backbones and fused ops for OpenMMLab',
    long_description=open(os.path.join(ROOT, 'README.md')).read() if os.path.exists(
        os.path.join(ROOT, 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmlinattn', 'mmlinattn.*']),
    python_requires='>=3.9,<3.12',
    install_requires=['torch>=2.0', 'mmengine>=0.10.0'],
    extras_require={
        'det': ['mmdet==3.3.0', 'mmcv>=2.0.0,<2.2.0', 'pycocotools'],
        'seg': ['mmsegmentation==1.2.2', 'ftfy', 'regex'],
        'cls': ['mmpretrain==1.2.0'],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
