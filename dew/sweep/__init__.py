"""``python -m dew.sweep --workdir=RUN --metric=NAME ...``: after training, search post-hoc EMA
length × guidance weight × guidance interval (× the guide's EMA length, for autoguidance) for
the setting a registered metric scores best, in a cheap coarse pass then a refined one
(Karras et al. 2024, EDM2 Sec. 3 / Fig. 5; autoguidance, Karras et al. 2024b). ``cli`` is the
command; ``grid`` the search and its resumable log (no JAX); ``plot`` the figure."""
