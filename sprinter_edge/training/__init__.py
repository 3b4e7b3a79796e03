"""Training a verifier for one draft/target pair: collect, train, export to ONNX, calibrate.

    sprinter-edge verifier collect --pair default --out runs/vdata --time-budget 20
    sprinter-edge verifier train --data runs/vdata --out models/verifiers/PAIR.onnx
    sprinter-edge verifier calibrate models/verifiers/PAIR.onnx --max-fp-rate 0.3
"""
