"""What a machine is given before it runs: the datasets' official files downloaded
(fetch.py, `minips data download`) and the CURVE key files (keyfiles.py, `minips keys`)."""
