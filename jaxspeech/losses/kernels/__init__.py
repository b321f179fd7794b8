"""Fused loss kernels in Pallas: the recursions of the sequence losses with their time loop
inside one kernel launch (the XLA versions in `jaxspeech.losses` run one small loop
iteration per frame). `common` holds what every kernel shares: the kernel choice
(`loss.kernel`) and the platform a step is traced for."""
