"""Training the RL routers (torch, gymnasium): the environment over the
simulator (``env``), training episodes from any workload or trace
(``episodes``), the Double-DQN trainer (``trainer``) and its configuration
(``config``). Routing with a trained network needs none of this: see
``lbbench.routers.rl``.
"""
