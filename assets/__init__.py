"""The example code location's assets: cleaned -> inferred -> classified call transcripts."""
# documents.py: invoice PDFs -> parsed pages -> structured fields -> the invoices table.
