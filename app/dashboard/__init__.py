"""The Streamlit dashboard. Nothing here imports torch or transformers (not even indirectly)."""
