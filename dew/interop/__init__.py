"""Reading other projects' artifacts into dew: ``edm_pickle`` (NVlabs/edm's network pickles, read
without running their code, within ``pickle_bounds`` of the file's size) and ``edm_config`` (what
they say, as a dew config). Nothing here is
imported by ``import dew``."""
