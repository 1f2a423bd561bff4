"""Methods that score tokens by the attention the model paid them: H2O, TOVA, SnapKV, PyramidKV, CAKE, Scissorhands."""
