"""What the CLI's subcommands compose from the floors below: train, forecast, scorecard, doctor."""
