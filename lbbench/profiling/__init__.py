"""Profiles from physics and from measurement, and the simulator's fidelity against a live engine.

- ``models`` / ``gpus``: model architectures (Hugging Face configs) and the accelerator table;
- ``derive``: a profile from a roofline with a calibration's factors (``lbbench profile derive``; ``roofline_derive``,
  ``calibration``);
- ``physics``: what a profile's numbers imply (MFU, bandwidth utilization);
- ``measure``: a profile fitted to a live vLLM (``lbbench profile measure``);
- ``fidelity``: the same requests live and simulated, compared (``lbbench fidelity``).
"""
