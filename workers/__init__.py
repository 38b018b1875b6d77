"""What runs beside or inside Ray: the dispatcher, the driver, built-in training templates."""
