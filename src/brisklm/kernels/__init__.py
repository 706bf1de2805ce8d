"""brisklm's native CPU kernels (C, built at run time) and their loader; see ``native``."""
