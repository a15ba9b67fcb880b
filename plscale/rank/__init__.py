"""What runs inside each rank: distributed init, logs, metrics, data and model builders."""
