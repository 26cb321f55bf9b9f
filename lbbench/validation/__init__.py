"""The simulator against measured runs of real GPU servers: setups from measured rows, simulation, errors, fits."""
