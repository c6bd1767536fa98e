"""Fitting and scoring against reference data: the fitting procedures, published and development runs mapped to plans and compared, vTrain, uncertainty bands."""
