"""What runs inside each rank, and nothing lab-specific: start and finish (runtime), distributed
init, the mesh's process groups, logs, metrics, the memory census and allocator history, the comms
logger's reader, data and model builders. The strategies a lab teaches are plscale/strategies."""
