"""Generated from proto/ by scripts/generate_proto.py. Do not edit."""
