"""The example code location's assets: cleaned -> inferred -> classified call transcripts."""
