"""End-to-end numerical verification: every lowered op, every target, fp32 and fp16."""
