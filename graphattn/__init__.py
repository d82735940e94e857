"""graphattn: compile typed document graphs into ETC global-local transformer inputs."""

__version__ = "0.1.0"
