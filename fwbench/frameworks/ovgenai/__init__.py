"""OpenVINO GenAI: OpenVINO's own generation loop over our exported decoder made stateful (phase generate)."""
