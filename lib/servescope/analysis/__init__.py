"""Pure functions over measurement DataFrames."""
