"""What every step stands on: settings, the Spark session and Delta JARs, the table layer and its
schemas, stage results, logging and progress. Imports nothing from the steps of the flow."""
