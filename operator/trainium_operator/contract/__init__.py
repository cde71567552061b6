"""What the operator and the training image share: the script's flags, the environment of
every pod (workload, profiler, Neuron capture), the NEFF cache layout and the health channel.

Standard library only, and nothing else of ours (an import-linter contract checks both): the
training images copy this package whole beside the profiler, without our dependencies.
"""
