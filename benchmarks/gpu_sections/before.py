"""The issue's "before" state, printed beside each table: what was measured without the GPU kernels."""

# The "before" state: one NVIDIA H100 80GB HBM3, torch 2.11+cu130, rlstab b3a5381, 2026-11.
BEFORE = {
    "where": "NVIDIA H100 80GB HBM3, torch 2.11+cu130, rlstab b3a5381, 2026-11",
    "ceilings": {"bf16_matmul_tflops": 780, "fp32_matmul_tflops": 51, "copy_gbps": 2980},
    "logits": {  # row -> path -> ms (and GiB held)
        "bf16 entropy, in graph": {
            "rlstab": 130,
            "trainer": 26.2,
            "floor": 1.7,
            "trainer_held_gib": 9.3,
            "rlstab_held_gib": 0.03,
        },
        "fp32 entropy, in graph": {
            "rlstab": 112,
            "trainer": 47.5,
            "floor": 3.3,
            "trainer_held_gib": 18.5,
            "rlstab_held_gib": 0.03,
        },
        "bf16 entropy grad": {"rlstab": 217, "trainer": 75.7},
    },
    "loss": {  # tokens -> path -> ms
        1 << 20: {
            "hand-written": 0.48,
            "stapo whole": 2.64,
            "stapo frozen": 1.32,
            "grpo frozen": 2.22,
            "stare frozen": 1.80,
            "floor": 0.006,
        },
        4 << 20: {
            "hand-written": 0.56,
            "stapo whole": 3.31,
            "stapo frozen": 1.34,
            "grpo frozen": 2.33,
            "stare frozen": 1.81,
            "floor": 0.024,
            "hand-written, torch.compile": 0.64,
        },
        16 << 20: {
            "hand-written": 1.82,
            "stapo whole": 7.62,
            "stapo frozen": 2.85,
            "grpo frozen": 4.11,
            "stare frozen": 3.60,
            "floor": 0.096,
        },
    },
    "profile": {
        "hand-written": {"kernels": 37, "syncs": 2},
        "stapo frozen": {"kernels": 89, "syncs": 5},
        "stapo whole": {"kernels": 173, "syncs": 51},
    },
}
