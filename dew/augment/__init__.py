"""EDM's augmentation pipeline (NVlabs/edm ``training/augment.py``) as pure JAX: settings,
homogeneous 2-D/3-D transforms, the reflect-pad + wavelet up/warp/down resampler, and the
pipeline ``augment(settings, key, images) -> (images, labels)``."""
